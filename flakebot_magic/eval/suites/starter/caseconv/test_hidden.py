"""Hidden checks of caseconv: each case, and word boundaries at spaces, separators and case changes."""

import pytest

CASES = {
    "snake": {"Hello World": "hello_world", "userName": "user_name", "already-kebab-case": "already_kebab_case"},
    "kebab": {"Hello World": "hello-world", "userName": "user-name", "MAX_VALUE": "max-value"},
    "camel": {"hello world": "helloWorld", "user_name": "userName", "Some-Thing": "someThing"},
    "pascal": {"hello world": "HelloWorld", "user_name": "UserName", "some-thing": "SomeThing"},
    "shouty": {"hello world": "HELLO_WORLD", "userName": "USER_NAME", "some-thing": "SOME_THING"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case(tool, case):
    lines = CASES[case]
    out = tool("--to", case, input="".join(f"{line}\n" for line in lines))
    assert out.splitlines() == list(lines.values())
