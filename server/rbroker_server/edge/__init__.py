"""What stands between the network and the routes: the client address behind trusted
proxies and the external path prefix (`net`), `HEAD` answered as `GET` (`asgi`), per-client
rate limits (`ratelimit`), the checks every JSON body passes first (`bodies`), deadlines and
caps on connections below the app (`slow_clients`) and the self-signed certificate that
`setup --self-signed` makes (`tls`)."""
