"""Example pipelines: Flink's word count and a Nexmark-style bid stream.

Each module holds the pipeline, a deterministic data generator and a ground truth computed
in plain Python, independently of the engine; ``tests/integration/test_examples.py`` runs
them end to end.
"""
