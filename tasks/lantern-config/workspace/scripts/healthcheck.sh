#!/bin/sh
# Exits 0 when the service answers on the port the server section of config/app.yaml gives it.
PORT=$(awk '/^  port:/ {print $2; exit}' config/app.yaml)
curl -fsS "http://127.0.0.1:${PORT}/health" > /dev/null
