"""File readers shared by the catalog datasets, one module per format (as torchvision keeps
them): :mod:`.images` (image files: the one suffix set, decoding, the one uint8 resize),
:mod:`.idx` (MNIST's idx files), :mod:`.mat` (MATLAB v5 files), :mod:`.libsvm` (LIBSVM text)
and :mod:`.jsonfile` (size-bounded JSON). Every reader raises a one-line
:class:`~fedshift.core.errors.DatasetError` naming the file on a missing or malformed one."""
