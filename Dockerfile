FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY runner runner
COPY governance governance
COPY tenants tenants
COPY adapters adapters
COPY client client
RUN pip install --no-cache-dir .
EXPOSE 8080
STOPSIGNAL SIGTERM
CMD ["quorum", "serve"]
