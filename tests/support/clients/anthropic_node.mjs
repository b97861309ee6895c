// @anthropic-ai/sdk against a chatgate's Messages API (run by tests/system/test_anthropic_clients.py):
// `node anthropic_node.mjs '{"baseURL":…,"apiKey":…,"model":…,"prompt":…,"maxTokens":…,"toolResult":…}'` prints what
// each call gave back, as JSON: create, the stream helper, a forced tool call and the turn that
// sends its result back, countTokens, and the SDK's typed errors for a 400 and a 401.
import Anthropic from "@anthropic-ai/sdk";

const { baseURL, apiKey, model, prompt, maxTokens, toolResult } = JSON.parse(process.argv[2]);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const user = [{ role: "user", content: prompt }];
const asked = { model, max_tokens: maxTokens, temperature: 0, messages: user };
const WEATHER = {
  name: "get_weather",
  description: "The weather in a city.",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};

function message(answer) {
  const { id, type, role, model, content, stop_reason, stop_sequence, usage } = answer;
  return { id, type, role, model, content, stop_reason, stop_sequence, usage };
}

async function refused(call) {
  try {
    await call();
  } catch (error) {
    return {
      class: error.constructor.name,
      typed: {
        BadRequestError: error instanceof Anthropic.BadRequestError,
        AuthenticationError: error instanceof Anthropic.AuthenticationError,
      },
      status: error.status,
      body: error.error,
      requestID: error.requestID ?? null,
    };
  }
  return null;
}

const created = await client.messages.create(asked);

const texts = [];
const events = [];
const stream = client.messages.stream(asked);
stream.on("text", (text) => texts.push(text));
stream.on("streamEvent", (event) => events.push(event.type));
const final = await stream.finalMessage();

const forced = await client.messages.create({
  ...asked,
  tools: [WEATHER],
  tool_choice: { type: "tool", name: "get_weather" },
});
const call = forced.content.find((block) => block.type === "tool_use");
const answered = await client.messages.create({
  ...asked,
  tools: [WEATHER],
  messages: [
    ...user,
    { role: "assistant", content: forced.content },
    { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: toolResult }] },
  ],
});

const counted = await client.messages.countTokens({ model, messages: user, tools: [WEATHER] });
const countedPlain = await client.messages.countTokens({ model, messages: user });

const wrongKey = new Anthropic({ baseURL, apiKey: "not-the-key", maxRetries: 0 });
console.log(
  JSON.stringify({
    create: message(created),
    stream: { texts, events, final: message(final) },
    forced: message(forced),
    answered: message(answered),
    countTokens: { withTools: counted, plain: countedPlain },
    badRequest: await refused(() => client.messages.create({ model, messages: user })),
    badRole: await refused(() =>
      client.messages.create({ ...asked, messages: [{ role: "robot", content: prompt }] }),
    ),
    unauthorized: await refused(() => wrongKey.messages.create(asked)),
  }),
);
