"""The Airflow plugin shipped with the provider: the TorchX jobs pages in Airflow's UI."""
