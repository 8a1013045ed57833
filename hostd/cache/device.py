"""The device cache lives in the host core now (hostd/core/device.py); this name stays for existing imports."""

from hostd.core.device import DeviceCache

__all__ = ["DeviceCache"]
