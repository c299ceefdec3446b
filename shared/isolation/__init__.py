"""Running code evalq does not trust: process privileges, the environment of child processes, and
the sandbox (Landlock, seccomp, namespaces) of an isolated model host."""
