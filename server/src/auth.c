/* auth.c - bearer tokens and the loopback rule (see auth.h). */
#include "auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

int srv_auth_token_equal(const char *given, size_t given_len, const char *secret)
{
    size_t slen = strlen(secret);
    size_t n = given_len > slen ? given_len : slen;
    /* every byte of the longer string is visited; a length difference alone makes it unequal */
    unsigned diff = given_len != slen;
    for (size_t k = 0; k < n; k++) {
        unsigned char a = k < given_len ? (unsigned char)given[k] : 0;
        unsigned char b = k < slen ? (unsigned char)secret[k] : 0;
        diff |= (unsigned)(a ^ b);
    }
    return diff == 0;
}

int srv_auth_bearer_ok(const char *authorization, const char *secret)
{
    if (authorization == NULL || secret == NULL || secret[0] == '\0')
        return 0;
    if (strncasecmp(authorization, "Bearer", 6) != 0 || authorization[6] != ' ')
        return 0;
    const char *tok = authorization + 6;
    while (*tok == ' ')
        tok++;
    return srv_auth_token_equal(tok, strlen(tok), secret);
}

int srv_auth_is_loopback(const char *addr)
{
    if (addr == NULL)
        return 0;
    struct in_addr a4;
    if (inet_pton(AF_INET, addr, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    struct in6_addr a6;
    if (inet_pton(AF_INET6, addr, &a6) != 1)
        return 0;
    if (IN6_IS_ADDR_LOOPBACK(&a6))
        return 1;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}
