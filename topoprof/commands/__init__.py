"""The command stage: one module per command, named for it, that turns its options into one
typed request and hands it to the stage that does the work. A feature's name recurs down the
stages with the same role at each: `profile`, `bench` and `user_model` are also the measuring
stage's modules for that command (`topoprof.measure`), `scan` the model's inputs for a scan's
predictions (`topoprof.model.inputs.scan`); the folder says which stage.
"""
