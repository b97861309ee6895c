"""The admission steps, each a small object with one method, `apply(admission)`: it raises the
GatewayError that refuses the request, or records on the admission what later steps and the
answer need. `apply` is a plain method; it returns an awaitable only when the step must wait
(a store to ask, a tokenizer in a thread, images to fetch): no coroutine for the rest.
`needed` says, when the pipeline is built, whether a deployment has anything for the step to do
(a step with nothing to do is left out of its list)."""

from __future__ import annotations

from collections.abc import Awaitable

from gateway.config.settings import Key
from gateway.core.disconnect import unless_client_leaves
from gateway.core.errors import DeploymentForbidden
from gateway.core.token_count import estimate
from gateway.fleet.router import RoutedDeployment, Router
from gateway.policy import capabilities
from gateway.policy.admission import Admission, Policy
from gateway.policy.budgets import accounts, exhausted, most_generated, reservation
from gateway.policy.extra_params import DROPPED_HEADER, apply_extra_params, dropped_header, resolve_policy
from gateway.policy.extra_params import HEADER as EXTRA_PARAMS_HEADER
from gateway.policy.limits import Bucket, limited_kinds, rate_headers, refused, too_large


class Route:
    """The request's model name (or a dialect's routing header) → its deployment."""

    title = "route"

    def __init__(self, router: Router) -> None:
        self.router = router

    def apply(self, admission: Admission) -> None:
        request, record = admission.request, admission.record
        record.key = admission.caller.name
        deployment = admission.deployment = self.router.route(request.model, admission.routed_to)
        record.deployment = request.deployment = deployment.name
        record.model = request.model or deployment.model
        record.backend = deployment.config.backend


class KeyMayUse:
    """A key names the deployments it may use (403 otherwise)."""

    title = "key may use it"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.keyed

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        pass

    def apply(self, admission: Admission) -> None:
        if not admission.caller.may_use(admission.deployment.name):
            raise DeploymentForbidden(
                admission.deployment.name, asked=admission.routed_to or admission.request.model
            )


class ExtraParameters:
    """Parameters the deployment does not take: refused, dropped or passed on, as the deployment
    and the request's header say."""

    title = "extra parameters"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return True  # the request's header may ask for a policy of its own

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.default = routed.config.extra_parameters

    def apply(self, admission: Admission) -> None:
        chosen = resolve_policy(admission.asked.get(EXTRA_PARAMS_HEADER), self.default)
        dropped = apply_extra_params(admission.request, chosen)
        request = admission.request
        # what the dialect itself dropped, unless the upstream takes the body as it came
        speaks = admission.deployment.capabilities.native
        native = request.native is not None and request.native.dialect in speaks
        if request.dropped and not native:
            dropped = sorted({*dropped, *request.dropped})
        if dropped:
            admission.headers.append((DROPPED_HEADER.encode(), dropped_header(dropped)))


class CountPrompt:
    """The prompt's tokens, with the deployment's tokenizer or estimated."""

    title = "count the prompt"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return True  # the capabilities, limits and budgets read the count

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.counter = policy.counters[routed.name]

    def apply(self, admission: Admission) -> Awaitable[None] | None:
        """Estimated at once; counted with a tokenizer (in a thread, for a long prompt)."""
        if self.counter.exact:
            return self.counted(admission)
        request = admission.request
        admission.prompt_tokens = request.prompt_tokens = estimate(request.messages)
        return None

    async def counted(self, admission: Admission) -> None:
        request = admission.request
        admission.prompt_tokens = request.prompt_tokens = await self.counter.count(request.messages)


class CheckCapabilities:
    """What the deployment's model can take: parameters, ranges, modalities, context (404/422)."""

    title = "capabilities"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return True

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        pass

    def apply(self, admission: Admission) -> None:
        # read from the deployment at each request: a probe may narrow them while serving
        capabilities.check(admission.request, admission.deployment.capabilities, admission.prompt_tokens)


class DefaultMaxTokens:
    """An answer is bounded like the model's, where the deployment says, when the request
    sets no bound."""

    title = "default max_tokens"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return routed.capabilities.default_max_tokens is not None

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        pass

    def apply(self, admission: Admission) -> None:
        request = admission.request
        if request.max_tokens is None:
            request.max_tokens = admission.deployment.capabilities.default_max_tokens


class PromptFilter:
    """The content filter's input rules (400 `content_filter`)."""

    title = "content filter (prompt)"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.content_filter.input is not None

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.check = policy.content_filter.check_prompt

    def apply(self, admission: Admission) -> None:
        self.check(admission.request.messages)


class RateLimits:
    """The key's and the deployment's requests and tokens a minute (429); the headers that say
    what is left."""

    title = "rate limits"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.key_limited or bool(policy.deployment_limits[routed.name])

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.limiter = policy.limiter
        self.key_limits = policy.key_limits
        self.deployment_limits = policy.deployment_limits[routed.name]

    def apply(self, admission: Admission) -> Awaitable[None] | None:
        key_limits = self.key_limits.get(admission.caller.name, ())
        buckets = admission.buckets = [*key_limits, *self.deployment_limits]
        return self.take(admission, buckets) if buckets else None

    async def take(self, admission: Admission, buckets: list[Bucket]) -> None:
        verdict = await self.limiter.take(buckets, admission.charged_prompt_tokens)
        if not verdict.allowed:
            oversized = too_large(verdict)  # looked for only once refused: no cost when admitted
            admission.record.rate_limited = "tokens" if oversized else limited_kinds(verdict)
            raise oversized or refused(verdict)
        headers = rate_headers(verdict)  # before any other header the answer carries
        admission.headers = headers + admission.headers if admission.headers else headers


class Budgets:
    """The key's budgets (tokens or cost a day, week or month): the prompt reserved, and with a
    hard budget the most the answer may generate too (429 when used up)."""

    title = "budgets"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.budgeted

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.limiter = policy.limiter
        self.price = routed.config.price

    def apply(self, admission: Admission) -> Awaitable[None] | None:
        key = admission.caller.key
        return self.reserve(admission, key) if key is not None and key.budgets else None

    async def reserve(self, admission: Admission, key: Key) -> None:
        request, limiter = admission.request, self.limiter
        found = accounts(key.name, key.budgets, limiter.now())
        # a hard budget holds the most the answer may generate, too
        hard = any(b.hard for b in key.budgets)
        completion = most_generated(request, admission.deployment.capabilities) if hard else 0
        held = reservation(found, admission.charged_prompt_tokens, self.price, completion)
        used_up = await limiter.reserve(held)
        if used_up is not None:
            admission.record.rate_limited = "budget"
            account, spent = used_up
            asked = held.amounts[held.accounts.index(account)]
            raise exhausted(account, spent, asked, limiter.now())
        admission.reservation = held


class MediaScreen:
    """Images: refused in none of the accepted forms or from where this server takes none; local
    files read and remote images fetched into data: URLs (dialects that screen media only)."""

    title = "media screen"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return True  # whether a request names images is seen per request

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.media = policy.media

    def apply(self, admission: Admission) -> Awaitable[None] | None:
        if not self.media.names_images(admission.request):
            return None
        assert admission.receive is not None, "a dialect that screens media hands the receive channel"
        # files read and images fetched stop when the client leaves
        return unless_client_leaves(self.screened(admission), admission.receive)

    async def screened(self, admission: Admission) -> None:
        admission.media = await self.media.screen(admission.request)
