"""Decisions: from the facts to a plan (fits, sizing, the KV budget, the commands), nothing run."""
