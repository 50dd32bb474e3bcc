-- MLflow's backend store lives next to Airflow's metadata DB in the same PostgreSQL.
CREATE DATABASE mlflow OWNER airflow;
