"""Answers: the read-only query layer over the published file (Graph), offline answers to
questions, the tool-calling agent, and pictures and GraphML of the graph."""
