"""The run summary: headline numbers of every stage, each with the command that
reproduces it (`results/summary.md`)."""
