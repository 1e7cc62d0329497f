"""Everything that exists for tests and demos, outside the installed package.

- ``services``: the local Kafka-compatible broker (Tansu) and S3 server (SeaweedFS);
- ``airflow_stack``: ``airflow standalone`` on loopback and a REST API v2 client;
- ``demo`` (``make demo``) and ``demo_engine`` (``make demo-engine``);
- ``faults``: arming the named crash and slow points of ``microcheckpoint.faults``.
"""
