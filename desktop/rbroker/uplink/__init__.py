"""Uplink: enrollment, key storage and signed reports from a broker to the coordinator.

Reporting is never permission: nothing here touches the lease table, and coordinator or
network outages only change the link state (DESIGN §7).
"""
