"""The built-in data sets, one module each (each registers its class with
:func:`fedclust.data.registry.register`; the registry imports every module
here).  A new data set is one more module here, or a plugin file."""
