"""The fleet's declarations: the node classes (nodes.py), questions about them and the engines
(registry.py), the data contract (contract.py), host data validated against it (data.py), the
operator's fleet.yml as pyinfra groups (inventory.py)."""
