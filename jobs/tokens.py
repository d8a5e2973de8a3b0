from django.contrib.auth.models import User

from jobs.models import ApiToken


def user_for_token(key: str) -> User | None:
    if not key:
        return None
    token = ApiToken.objects.select_related("user").filter(digest=ApiToken.hash(key)).first()
    if token is None or not token.user.is_active:
        return None
    return token.user
