"""How long a collective takes on links: the ring (alpha-beta) model and the measured curve
(`collectives`), comm models from a bench fit, a topology's NVLink/PCIe rings or numbers
(`links`), NCCL's channels over an NVLink mesh (`channels`), and what TCP's slow start can cost a
multi-node step (`tcp`).

Owns: the `CommModel`s. May import: topoprof.errors and topoprof.topology (the links' nominal
figures); nothing else of the model.
"""
