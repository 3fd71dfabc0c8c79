"""DL²: policy and value networks, supervised warm-up on DRF, actor-critic RL, ONNX export."""
