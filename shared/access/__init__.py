"""Who may see and spend what: the tier rules (policy), roles, the Ladder's release, the budget
ledger, the dataset registry, tokens and priorities. Used by the producer side only; workers
never import it."""
