"""State encoders shared by training (policy_models) and serving (policies), versioned.

A model card names the encoder version a model was trained with; loading a model whose card
names another version is an error, never a silent wrong answer.
"""
