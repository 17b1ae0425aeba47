from django.db import models


class Execution(models.Model):
    """One run of a test job, written in the job's own transaction."""

    job_id = models.UUIDField(db_index=True)
    worker_id = models.CharField(max_length=255)
    attempt = models.IntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()


class Order(models.Model):
    """A business row written next to an enqueue in the same transaction."""

    reference = models.CharField(max_length=50)
