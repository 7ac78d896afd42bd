"""Which prompts go out and which finished groups train a step: the prompt loader, the ledger, the samplers.

Pure standard library; the controller's pumps drive them, and their state rides in every checkpoint.
"""
