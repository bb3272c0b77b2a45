"""A third-party scheduler plugin for tests, registered through the entry point group
``airflow_provider_torchx.schedulers`` by ``register_plugin`` (a ``*.dist-info`` on
``sys.path``); nothing in the provider knows its name."""
