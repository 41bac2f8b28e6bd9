"""Example functions; import targets such as ``examples.greeter.functions:functions``."""
