"""Generated protobuf modules (built from the .proto files beside this file by setup.py)."""
