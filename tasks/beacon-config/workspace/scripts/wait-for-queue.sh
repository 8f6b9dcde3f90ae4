#!/bin/sh
# Waits until the message queue accepts connections, then starts the web app.
until nc -z queue 5672; do
  sleep 1
done
exec beacon-web --settings /app/settings.toml
