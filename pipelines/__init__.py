"""Distributed-training platform benchmark: BERT-tiny on IMDB through each registered training platform
(``pipelines.platforms``: one package per platform, compared with the reference one).

Importable and testable without Airflow; the DAGs in ``dags/`` only wire these functions.
"""

__version__ = "0.1.0"
