"""Validation: real training loops for every strategy on the ranks, measured against the
prediction (`run`), and what the rank worker measured reduced to the model's inputs with their
spreads (`rotations`).

Owns: predicted against measured. May import: every other room of the model.
"""
