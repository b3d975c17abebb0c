"""A well-behaved credit rule whose code the tests edit between training and auditing
(tests/test_audit_guest_code.py): audit must refuse to rebuild a run with code other than
the code it trained with.

- ``fx2-bp``: backprop under another name; passes the door as it is shipped.
"""

from creditaudit.methods.bp import BP


class PlainBP(BP):
    name = "fx2-bp"
    label = "plain BP"
