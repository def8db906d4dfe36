"""Task checks (pure logic on strings): words for facts, the first JSON object for tool calls."""

from kvlab import tasks

TOOL = {"json_tool": {"name": "get_weather", "arguments": ["city"]}}


def test_contains_any():
    assert tasks.passes("The capital of France is Paris.", {"contains_any": ["Paris"]})
    assert not tasks.passes("It is Lyon.", {"contains_any": ["Paris"]})


def test_tool_call_in_code_fence_passes():
    assert tasks.passes('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', TOOL)


def test_tool_call_with_wrong_argument_name_fails():
    assert not tasks.passes('{"name": "get_weather", "arguments": {"location": "Paris"}}', TOOL)
    assert not tasks.passes('{"name": "get_time", "arguments": {"city": "Paris"}}', TOOL)
    assert not tasks.passes("def get_weather(city): ...", TOOL)


def test_first_object_is_used_when_several_follow():
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}\nAnother: {"name": "x"}'
    assert tasks.first_json_object(text)["name"] == "get_weather"


def test_task_file_has_unique_ids_and_known_checks():
    items = tasks.load_tasks()
    assert len({t["id"] for t in items}) == len(items) >= 10
    assert all(set(t["check"]) <= {"contains_any", "json_tool"} for t in items)
