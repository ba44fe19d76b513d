"""Integrations of reco's objectives into trainers (import the one you use: ``reco.integrations.verl``,
``reco.integrations.trl``)."""
