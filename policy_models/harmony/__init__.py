"""Harmony placement (Bao et al., ToN 2022): training, the reward model and ONNX export."""
