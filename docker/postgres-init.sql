-- MLflow's backend store and its basic-auth user store live next to Airflow's metadata DB in
-- the same PostgreSQL (run once, when the data volume is created).
CREATE DATABASE mlflow OWNER airflow;
CREATE DATABASE mlflow_auth OWNER airflow;
