"""The greeter example: see README.md beside this file."""
