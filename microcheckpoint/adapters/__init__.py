"""Adapters at the edge: S3 storage (boto3) and Kafka offsets (kafka-python)."""
