"""The workload stage: what is trained. Takes nothing but the base and gives a parameter layout
(`layout`: tensors in registration order, the forward's uses and their FLOPs per token), the
presets' layouts (`presets`: GPT-2, BERT, GPT-3 XL, LLaMA; `vision`: ResNet and ResNeXt per image),
the synthetic model `validate` trains (`synthetic`: its spec and the training worker's config) and
the activation checkpointing modes (`checkpointing`). The model prices these; the zoo builds them
as torch modules; the rank workers train them: so it sits below all three.
"""
