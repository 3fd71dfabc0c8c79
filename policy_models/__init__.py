"""Training code for mlsched's learned policies (torch) and the shipped ONNX artifacts.

Depends on `mlsched` (the simulator and the state encoders); `mlsched` never imports this
package, it only loads the `.onnx` files it produces.
"""
