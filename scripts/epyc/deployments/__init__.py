"""Deployments: a plan's servers started, verified, stopped and recorded in their state folders."""
