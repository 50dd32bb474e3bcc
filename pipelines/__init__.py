"""Distributed-training platform benchmark: BERT-tiny on IMDB through DDP, Spark and Determined.

Importable and testable without Airflow; the DAGs in ``dags/`` only wire these functions.
"""

__version__ = "0.1.0"
