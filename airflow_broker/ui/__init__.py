"""The broker's pages in Airflow's UI: an Airflow plugin (plugin.py) with a FastAPI app
(api.py, authorised by access.py, reading and changing the broker through console.py) and a
React app (www/, its built bundle in www/dist/)."""
