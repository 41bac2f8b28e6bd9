"""Egresses: where function output leaves the runtime (stdout, files, HTTP replies, Kafka)."""

from statefun.egress.base import EgressRecord, Sink, describe_typed_value
from statefun.egress.file import FileSink
from statefun.egress.stdout import StdoutSink

__all__ = ["EgressRecord", "FileSink", "Sink", "StdoutSink", "describe_typed_value"]
