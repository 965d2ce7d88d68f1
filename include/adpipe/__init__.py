"""adpipe: exactly-once ad event counting on Kafka, Spark and Delta."""

__version__ = "0.1.0"
