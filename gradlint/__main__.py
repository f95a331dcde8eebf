"""``python -m gradlint`` runs the command line."""

from gradlint.cli import main

main()
