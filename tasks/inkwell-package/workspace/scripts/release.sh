#!/bin/sh
set -e
python -m pytest
python -m build
twine upload dist/*
