"""The ArCHer family (ArCHer, online CHAI, online filtered BC; Zhou et al. 2024): replay buffer, utterance-level
double critic, and the trainer that drives them with the project's agent proxy, engine and policy workers.

Run with ``python -m ragen.archer --config-name archer_twenty_questions`` (or ``bash scripts/train_archer.sh``).
"""
