"""Pure functions of models and tensors: norms, per-sample gradients, alignment, ….

Nothing here changes a model, an optimiser or a random stream used by training.
"""
