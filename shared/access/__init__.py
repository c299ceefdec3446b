"""Who may see and spend what, each rule in a module named for it: the tier rules (policy),
roles, priorities, the release mechanisms (ladder) and the Ladder's state (release), the one
answer to what a reader may see of a run (disclosure), budgets and their ledger, registered
datasets and their registry, and tokens. Used by the producer side only; workers never
import it."""
