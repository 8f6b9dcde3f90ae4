#!/bin/sh
set -e
python -m build
twine upload -u __token__ -p "$PYPI_TOKEN" dist/*
