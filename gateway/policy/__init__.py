"""Gateway policy, applied once for every dialect: the steps, and their order in pipeline.py."""
