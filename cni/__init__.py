"""pycni: the CNI side (thin executables, spec types, plugins, netlink mechanisms).

Keep this file free of imports: the plugin executables import ``cni.exe`` and must load
only the standard library.
"""
