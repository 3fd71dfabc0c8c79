"""mlsched: schedule distributed ML training jobs on Kubernetes with learned policies.

The runtime package. It never imports torch: learned policies are served from ONNX files.
"""

__version__ = "0.1.0"
