"""`python -m runner`: the same CLI as the `runner` command."""

from runner.cli import main

if __name__ == "__main__":
    main()
