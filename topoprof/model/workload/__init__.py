"""What is trained, as the model sees it: a parameter layout (`layout`: tensors in
registration order, the forward's uses and their FLOPs per token), the presets' layouts (`presets`:
GPT-2, BERT, GPT-3 XL, LLaMA; `vision`: ResNet and ResNeXt per image), and the synthetic model
`validate` trains (`synthetic`).

Owns: layouts and the constants they are counted by. May import: nothing else of the model
(topoprof.errors only); every other room reads layouts from here.
"""
