import pytest


@pytest.mark.xdist_group("distributed")
def test_a_marked_group_reaches_the_xdist_scheduler(request):
    # The two-process launches share accelerate's default rendezvous port and run one at a time only because their
    # group keeps them on one worker; pytest-xdist groups by an "@group" suffix on the test id, which some pytest
    # versions lose (requirements.txt bounds it). Under `-n 0` there is no scheduler to check.
    if request.config.getoption("loadgroup", default=False):
        assert request.node.nodeid.endswith("@distributed"), request.node.nodeid


def test_a_shared_fixture_puts_its_tests_in_one_group(request, short_run):
    # tests/conftest.py groups the tests of a fixture built once per worker (short_run makes its runs on first use,
    # so asking for it costs nothing here); it must run before pytest-xdist turns the groups into test ids
    if request.config.getoption("loadgroup", default=False):
        assert request.node.nodeid.endswith("@short_run"), request.node.nodeid
